"""The reply reward's dialogue guards: a relative nobody named, a thing of someone else's called the speaker's."""

from trace_dspy.compact.guards import brings_in_relative, takes_theirs


def test_a_relative_the_dialogue_never_names_is_another_situation():
    flight = ["My flight home for the holidays got delayed by two days."]
    assert brings_in_relative("How are you feeling about your brother's wedding?", flight) == "your brother"
    assert brings_in_relative("How are you feeling about your little brother?", flight) == "your brother"
    assert brings_in_relative("That's awful news. How is your family taking it?", flight) == "your family"
    assert brings_in_relative("That's awful news about your flight home.", flight) is None
    # Named in other words, by the listener, or as any relative for "family": known.
    assert brings_in_relative("How is your son?", ["We found out today it is a boy!"]) is None
    assert brings_in_relative("Say hi to your mom.", ["My mother called."]) is None
    assert brings_in_relative("How are your parents?", ["My dad called."]) is None
    assert brings_in_relative("How is your daughter?", ["I'm so tired.", "How old are your kids?", "Two."]) is None
    assert brings_in_relative("How is your family?", ["My wife is back next week."]) is None
    assert brings_in_relative("Did you and your dad play together?", ["I found my old toys at my dads place."]) is None
    assert brings_in_relative("Is your daughter okay?", ["My teen took the car out."]) is None
    # Someone else's relative is not theirs: a niece is not a daughter.
    assert brings_in_relative("I'm so happy about your daughter's success.", ["My niece got into art school."]) \
        == "your daughter"
    # People who need no introduction, and relatives of other people, are left alone.
    assert brings_in_relative("How do you like your new boss?", ["I started a new job today."]) is None
    assert brings_in_relative("Her brother must be proud.", ["My friend won the race."]) is None


def test_a_thing_the_speaker_spoke_of_as_someone_elses_is_not_yours():
    barking = ["My neighbor's dog keeps barking all night and I can't sleep."]
    assert takes_theirs("How are you feeling about your dog?", barking) == "your dog"
    assert takes_theirs("How are your dogs?", ["my neighbor 's dog keeps barking"]) == "your dogs"  # ED's tokens
    assert takes_theirs("How are you feeling about the future of your team?",
                        ["watching my daughters play with their team", "the memories are awesome"]) == "your team"
    assert takes_theirs("I'm so happy for your wedding!", ["I gave the speech at my sister's wedding."]) \
        == "your wedding"
    # The speaker's own, nobody's in particular, or never named: left alone.
    assert takes_theirs("How are you feeling about your neighbor's behavior?", ["My neighbor hit my car."]) is None
    assert takes_theirs("How are you feeling about your sister's wedding?", ["the speech at my sister's wedding"]) \
        is None
    assert takes_theirs("How is your cat?", ["I have to put my old cat to sleep tomorrow."]) is None
    assert takes_theirs("How is your car?", ["The car broke down, and her car too."]) is None
    assert takes_theirs("How is your car?", ["My husband's car and my car both broke down."]) is None
    assert takes_theirs("How is your new job?", ["I start Monday!"]) is None
    assert takes_theirs("How is your dog?", ["It's dog days here."]) is None
